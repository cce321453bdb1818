"""The two Textual themes, dark and light. Phase colours are the same in both: prefill (compute) in the primary
colour, decode (bandwidth) in the secondary, so an operator reads the two pools the same way whatever the theme."""

from textual.theme import Theme

from fleetctl.themes import DARK, LIGHT

FLEET_DARK = Theme(
    name=DARK,
    primary="#4FA3FF",  # prefill / compute
    secondary="#F5A524",  # decode / bandwidth
    accent="#B48EAD",
    warning="#EBCB8B",
    error="#E5534B",
    success="#57AB5A",
    foreground="#D8DEE9",
    background="#10141A",
    surface="#171C24",
    panel="#202733",
    dark=True,
)

FLEET_LIGHT = Theme(
    name=LIGHT,
    primary="#0B5CAD",
    secondary="#B35900",
    accent="#7A4F8C",
    warning="#8A6100",
    error="#B3261E",
    success="#2E7D32",
    foreground="#1B1F24",
    background="#F7F8FA",
    surface="#FFFFFF",
    panel="#E8ECF1",
    dark=False,
)

THEMES = {theme.name: theme for theme in (FLEET_DARK, FLEET_LIGHT)}
