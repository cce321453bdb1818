"""The console with a Ray fleet's workers: the device cell names the node (and a lost one), and the
devices offered for start/restore/migrate are free slots on each of the fleet's nodes."""

from rich.text import Text
from support.console_fixture import worker

from fleetctl.console.tui.widgets.workers import device_cell
from fleetctl.engine.api.device_names import free_devices


def test_device_cell_names_the_node_and_a_lost_one() -> None:
    assert device_cell(worker("decode-0", "decode", "cpu:1")) == "cpu:1"  # a local fleet: unchanged
    assert device_cell(worker("decode-0", "decode", "cpu:1", node="local")) == "local/cpu:1"
    assert device_cell(worker("decode-0", "decode", "node2/cpu:1", node="node2")) == "node2/cpu:1"
    lost = device_cell(worker("decode-0", "decode", "node2/cpu:1", node="node2", node_lost=True))
    assert isinstance(lost, Text) and lost.plain == "node2/cpu:1 (node lost)"


def test_free_devices_per_node() -> None:
    local = [worker("decode-0", "decode", "cpu:0"), worker("decode-1", "decode", "cpu:1", state="failed")]
    assert free_devices(local, 3) == ["cpu:1", "cpu:2", "cpu:3"]
    on_nodes = [worker("decode-0", "decode", "node1/cpu:0"), worker("decode-1", "decode", "node2/cpu:1")]
    assert free_devices(on_nodes, 2) == ["node1/cpu:1", "node1/cpu:2", "node2/cpu:0", "node2/cpu:2"]
