"""The console's looks: the names of its two themes (palettes.py holds the Textual themes themselves, so that
the command line can name them without importing Textual) and the stylesheet every screen shares."""

from pathlib import Path

STYLESHEET = Path(__file__).with_name("console.tcss")
DARK = "fleet-dark"
LIGHT = "fleet-light"
THEME_NAMES = (DARK, LIGHT)
DEFAULT_THEME = DARK
