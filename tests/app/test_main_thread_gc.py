"""Cyclic garbage is collected on the GUI thread while a controller (and its worker threads) lives."""
import gc
import threading

from workbench.app import main_thread_gc


class _Cycle:
    def __init__(self, log: list[str]) -> None:
        self.me = self
        self.log = log

    def __del__(self) -> None:
        self.log.append(threading.current_thread().name)


def test_garbage_made_in_a_worker_is_collected_on_the_gui_thread(controller, qtbot):
    assert not gc.isenabled()  # the controller turned automatic collection off
    collector = main_thread_gc._collector
    log: list[str] = []

    def make_garbage():
        for _ in range(5000):  # well past generation 0's threshold: a worker would have collected
            _Cycle(log)

    worker = threading.Thread(target=make_garbage, name="worker")
    worker.start()
    worker.join()
    assert log == []  # nothing collected in the worker
    qtbot.waitUntil(lambda: len(log) == 5000, timeout=5000)
    assert set(log) == {threading.main_thread().name}
    assert gc.get_count()[0] < collector.thresholds[0]  # collected down to under the threshold


def test_the_last_controller_gives_automatic_collection_back(qtbot):
    from workbench.app.controller import Controller

    first, second = Controller(), Controller()
    first.shutdown()
    first.shutdown()  # twice: counted once
    assert not gc.isenabled()
    second.shutdown()
    assert gc.isenabled()
