"""The dashboard's lower panels: traffic (the `classify` split, latencies, handoffs, the busiest KV routes), this
host's devices, and the fleet's events (migrations, cold starts with their reason, failures, 429s, stalls): a list
across the screen, each line wrapped at words, whose `enter` (or a click) opens the event's every field."""

from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.widgets.format import clock, nbytes, percent, rate, seconds, show_text
from fleetctl.domain import EventKind
from fleetctl.engine.api.history import EventRecord

BAR = 14  # characters of the prefill/decode split bar
ROUTES_SHOWN = 3  # KV routes listed in the traffic panel, busiest first
LONG_VALUE = 16  # an event detail longer than this (a request id, a path) is cut in the list


def traffic_text(reading: FleetReading) -> str:
    """The store's last 5 minutes (requests, latencies, the phase split, handoff bytes) and the KV flow's busiest
    prefill → decode routes over the last minute (bytes per second, p99 handoff time)."""
    lines = [history_lines(reading) if reading.history is not None else reading.history_note]
    flow = reading.status.flow if reading.status else None
    routes = flow.routes if flow else []
    lines += [f"{r.prefill}→{r.decode} {nbytes(r.bytes_per_s)}/s p99 {seconds(r.p99_s)}"
              for r in routes[:ROUTES_SHOWN]]
    if len(routes) > ROUTES_SHOWN:
        lines.append(f"… {len(routes) - ROUTES_SHOWN} more prefill→decode route(s)")
    return "\n".join(lines)


def history_lines(reading: FleetReading) -> str:
    assert reading.history is not None
    traffic = reading.history.traffic
    ttft, tpot = traffic.ttft_s, traffic.tpot_s
    prefill, decode = traffic.prefill_share, traffic.decode_share
    filled = round(BAR * prefill) if prefill + decode else 0
    return (f"requests {rate(traffic.requests_per_s)}/s ({traffic.requests} in 5 min)\n"
            f"TTFT     p50 {seconds(ttft.p50)}  p99 {seconds(ttft.p99)}\n"
            f"TPOT     p50 {seconds(tpot.p50)}  p99 {seconds(tpot.p99)}\n"
            f"prefill {percent(prefill):>4} {'█' * filled}{'░' * (BAR - filled)} {percent(decode):>4} decode\n"
            f"handoff  {nbytes(traffic.handoff_bytes_per_s)}/s, {percent(traffic.handoff_share_of_e2e)} of e2e")


def devices_text(reading: FleetReading) -> str:
    host = reading.host
    lines = [f"host {host.get('host', '?')}"]
    for gpu in host.get("gpus", []):
        power = f"{gpu['power_w']:.0f} W" if gpu["power_w"] is not None else "— W"
        name = f"cuda:{gpu['index']}"
        lines.append(f"{name}  SM {percent(gpu['sm_util'])}  mem {nbytes(gpu['mem_used_bytes'])}  {power}")
        lines += [f"  {'#' + slot if slot else 'whole':<5} {worker.id}" for worker in reading.workers
                  for gpu_name, _, slot in [worker.device.partition("#")] if gpu_name == name]
    processes = host.get("processes", {})
    for worker in reading.workers:
        cpu = processes.get(worker.pid)
        if worker.device.startswith("cpu") and worker.pid:
            shown = "elsewhere" if worker.pid not in processes else "—" if cpu is None else f"{cpu:.0f}% cpu"
            lines.append(f"{worker.device:<6} {worker.id:<10} {shown:>8}")
    return "\n".join(lines)


def event_line(event: EventRecord) -> str:
    """One line an event: a stall in words; otherwise its details, a list (a move's stages) by its length."""
    details = dict(event.details)
    if event.kind == EventKind.STALL.value:
        return f"{clock(event.ts)} {event.kind:<9} {event.worker or '-':<10} {stall_text(details)}"
    moved = f"{details.pop('from')}→{details.pop('to')} " if "from" in details and "to" in details else ""
    extra = " ".join(detail(k, v) for k, v in details.items() if v is not None)
    return f"{clock(event.ts)} {event.kind:<9} {event.worker or '-':<10} {moved}{extra}"


def detail(key: str, value: object) -> str:
    """One detail of an event, short: a mode or device by itself, a list by its length, bytes and seconds in their
    units, a long id or path cut (the event's own screen has it whole)."""
    if key in ("mode", "device"):
        return str(value)
    if isinstance(value, list):
        return f"{key} {len(value)}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if key == "bytes" or key.endswith("_bytes"):
            return f"{key} {nbytes(value)}"
        if key.endswith("_s"):
            return f"{key.removesuffix('_s')} {seconds(value)}"
    text = str(value)
    cut = len(text) > LONG_VALUE and " " not in text  # an id or a path; a reason is a sentence, kept whole
    return f"{key} {text[:LONG_VALUE - 1] + '…' if cut else text}"


def stall_text(details: dict) -> str:
    """A stall event's details (engine/fleet/stalls.py) as a sentence."""
    if details.get("stalled"):
        return (f"stopped stepping: silent {details.get('silent_s', 0):g} s (bound {details.get('bound_s', 0):g} s), "
                f"holding {details.get('sessions', 0)} session(s)")
    return f"stall over after {details.get('lasted_s', 0):g} s: {details.get('ended', '')}"


class TrafficPanel(Static):
    def __init__(self) -> None:
        super().__init__(id="traffic")
        self.border_title = "traffic · 5 min"

    def show(self, reading: FleetReading) -> None:
        show_text(self, traffic_text(reading))


class DevicesPanel(Static):
    def __init__(self) -> None:
        super().__init__(id="devices")
        self.border_title = "devices"

    def show(self, reading: FleetReading) -> None:
        show_text(self, devices_text(reading))


class EventsPanel(OptionList):
    KEEP = 200  # events listed; older ones leave the top

    def __init__(self) -> None:
        super().__init__(id="events")
        self.border_title = "events"
        self.events: list[EventRecord] = []

    def show(self, reading: FleetReading) -> None:
        newest = self.events[-1].ts if self.events else float("-inf")
        fresh = [event for event in (reading.history.events if reading.history else []) if event.ts > newest]
        if not fresh:
            return
        following = self.highlighted is None or self.highlighted == self.option_count - 1
        self.events += fresh
        self.add_options(Option(event_line(event)) for event in fresh)
        while len(self.events) > self.KEEP:
            self.events.pop(0)
            self.remove_option_at_index(0)
        if following:  # the newest stays in view unless the operator went back to an older one
            self.scroll_end(animate=False)

    def selected_event(self, index: int) -> EventRecord:
        return self.events[index]
