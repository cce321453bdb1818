"""The console with a Ray fleet's workers: the device cell names the node (and a lost one), and the
devices offered for start/restore/migrate are free slots on each of the fleet's nodes."""

from rich.text import Text

from fleetctl.console.tui.flows import free_devices
from fleetctl.console.tui.widgets.workers import device_cell


def test_device_cell_names_the_node_and_a_lost_one() -> None:
    assert device_cell({"device": "cpu:1"}) == "cpu:1"  # a local fleet: unchanged
    assert device_cell({"device": "cpu:1", "node": "local", "node_lost": False}) == "local/cpu:1"
    assert device_cell({"device": "node2/cpu:1", "node": "node2", "node_lost": False}) == "node2/cpu:1"
    lost = device_cell({"device": "node2/cpu:1", "node": "node2", "node_lost": True})
    assert isinstance(lost, Text) and lost.plain == "node2/cpu:1 (node lost)"


def test_free_devices_per_node() -> None:
    local = [{"device": "cpu:0", "state": "running"}, {"device": "cpu:1", "state": "failed"}]
    assert free_devices(local, 3) == ["cpu:1", "cpu:2", "cpu:3"]
    on_nodes = [{"device": "node1/cpu:0", "state": "running"}, {"device": "node2/cpu:1", "state": "running"}]
    assert free_devices(on_nodes, 2) == ["node1/cpu:1", "node1/cpu:2", "node2/cpu:0", "node2/cpu:2"]
