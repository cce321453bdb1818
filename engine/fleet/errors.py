"""The fleet's expected failures, on the project's one root (`fleetctl.errors`): an operator's request that cannot
start (`OperationRefused`, with the HTTP status to answer), an operation that started and failed
(`OperationFailed`: its message is shown as the operation's error), one called off by a later operation,
and a request the fleet does not admit (each with its HTTP status). Anything else raised inside the fleet is a bug:
the operation runner logs it with its traceback and fails the operation as an internal error."""

from fleetctl.errors import FleetctlError, NotFound, UserError


class FleetError(FleetctlError):
    """An expected failure of the fleet; its message is meant for the operator."""


class OperationRefused(FleetError):
    """A request for an operation that cannot start (nothing changed); `status` is the HTTP status (400 bad input,
    404 an unknown name, 409 refused in the fleet's state, 422 …)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = self.http_status = status
        self.error_type = NotFound.error_type if status == 404 else UserError.error_type


class OperationFailed(FleetError):
    """An operation that started and failed; the message says why and in what state it left the fleet."""


class OperationCancelled(FleetError):
    """Raised inside an operation that a later one called off; the message says by what."""


class MoveFailed(OperationFailed):
    """A live session move was called off; the message says why and where the session went on."""


class FleetStartFailed(FleetError):
    """The fleet's first workers could not be placed or did not become ready."""


class AdmissionRefused(FleetError):
    """A request the fleet does not admit now."""

    http_status = UserError.http_status
    error_type = UserError.error_type


class FleetBusy(AdmissionRefused):
    """The fleet is at capacity: the client should come back after a moment (Retry-After)."""

    http_status = 429
    error_type = "rate_limit_error"


class NoWorkers(AdmissionRefused):
    """No live worker is left for a role the request needs."""

    http_status = 503
    error_type = "service_unavailable"


class FleetClosing(NoWorkers):
    """The fleet is shutting down and admits no new request (HTTP 503)."""


class RequestIdInUse(AdmissionRefused):
    """A client-chosen request id that a request in flight already has (HTTP 400)."""
