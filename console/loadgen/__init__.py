"""The load generator behind `fleetctl bench`: trace requests (synthetic, agent sessions, replayed files), the
runner that streams them against a fleet, its report, the colocated-vs-split comparison, and `fleetctl serve` run
as a child process (local_fleet) for the fleets it and the tests start."""
