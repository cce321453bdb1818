"""The dashboard's widgets; each renders a part of a FleetReading and updates in place."""
