"""`fleetctl demo`'s parts below the command: the traffic plan (schedule), the traffic thread (traffic) and the
headless report read from the metrics store (summary). It draws its requests with the load generator's words."""
