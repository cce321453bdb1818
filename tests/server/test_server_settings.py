"""The server's own settings (engine/server/server_settings.py): what `serve` listens on and how it shuts down
when nothing is given, and the `--grace` help naming the shutdown budget's own numbers."""

from fleetctl.engine.fleet.shutdown_budget import DEFAULT_GRACE_S, STOP_RESERVE_S, WORKER_EXIT_S
from fleetctl.engine.server.server_settings import ServerSettings
from fleetctl.options import declarations


def test_defaults_are_a_loopback_server_on_8700() -> None:
    settings = ServerSettings()
    assert (settings.host, settings.port, settings.api_key, settings.grace_s) == ("127.0.0.1", 8700, None,
                                                                                  DEFAULT_GRACE_S)
    assert (settings.access_log, settings.limit_concurrency, settings.ray, settings.store_reset) == (True, 0, None,
                                                                                                    False)


def test_the_grace_help_says_the_budget_s_numbers() -> None:
    grace = next(d.marker for d in declarations(ServerSettings) if d.field == "grace_s")
    assert f"all but {STOP_RESERVE_S:g} s" in grace.help and f"up to {WORKER_EXIT_S:g} s" in grace.help
    assert "seconds" in grace.help  # tests/console/cli/test_cli_errors.py: every duration says its unit
