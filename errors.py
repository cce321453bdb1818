"""The one root of fleetctl's expected failures: what can go wrong in normal use, said in one line for the person
who caused it or has to act on it. The CLI's `main` prints any of them as `fleetctl: error: <message>` and exits
with its `exit_code`; the server answers any of them with its `http_status` and OpenAI's error body of its
`error_type`. Which family an error belongs to says how it is answered, so no code lists error types to catch.
Anything else that escapes is a bug, shown as one (a traceback, or HTTP 500), never as a user's mistake.
Torch-free and importing nothing, so every layer may raise them (the store and the kernels included)."""


class FleetctlError(Exception):
    """An expected failure: its message is one line meant for people."""

    exit_code = 1
    http_status = 500
    error_type = "server_error"
    hint = ""  # what to do about it where the message cannot say: the CLI prints it after the message


class UserError(FleetctlError):
    """Bad input: a malformed request or option, a value out of range, a file that is not what it should be."""

    http_status = 400
    error_type = "invalid_request_error"


class NotFound(UserError):
    """A name that names nothing: an unknown worker, request, operation, checkpoint or model."""

    http_status = 404
    error_type = "not_found_error"
