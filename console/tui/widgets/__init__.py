"""The dashboard's widgets; each renders a part of a FleetSnapshot and updates in place."""
