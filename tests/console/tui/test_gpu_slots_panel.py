"""The devices panel lists each GPU with the workers on it: its slots (`cuda:0#1`) or the one worker that has it
whole."""

from support.console_fixture import HOST, STATUS, worker

from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.widgets.panels import devices_text

GPU = {"sm_util": 0.5, "mem_used_bytes": 40 << 30, "power_w": 310.0}


def test_the_devices_panel_shows_the_slots_of_each_gpu() -> None:
    workers = [worker("prefill-0", "prefill", "cuda:0#0"), worker("decode-0", "decode", "cuda:0#1"),
               worker("decode-1", "decode", "cuda:1"), worker("decode-2", "decode", "cuda:10")]
    host = HOST | {"gpus": [GPU | {"index": 0}, GPU | {"index": 1}]}
    text = devices_text(FleetReading(True, status=STATUS.model_copy(update={"workers": workers}), host=host))
    lines = text.splitlines()
    gpu0, gpu1 = (next(i for i, line in enumerate(lines) if line.startswith(f"cuda:{n} ")) for n in (0, 1))
    assert lines[gpu0 + 1:gpu0 + 3] == ["  #0    prefill-0", "  #1    decode-0"]
    assert lines[gpu1 + 1:] == ["  whole decode-1"]  # cuda:10 is not cuda:1's
