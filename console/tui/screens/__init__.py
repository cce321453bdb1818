"""The console's screens: the dashboard, a worker's detail, help, and the modal dialogs of actions."""
