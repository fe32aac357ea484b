"""The embedded default's broker: kombu's file transport whose messages are renamed into place
whole (config.broker), so a consumer never lists a half-written one."""

from __future__ import annotations

import os

from kombu import Connection

from config import broker


def test_a_message_is_written_aside_then_renamed_and_read_back(tmp_path, monkeypatch):
    seen_while_writing: list[list[str]] = []
    real_replace = os.replace

    def replace(src, dst):
        seen_while_writing.append(sorted(n for n in os.listdir(tmp_path) if n != "control"))
        real_replace(src, dst)

    monkeypatch.setattr(broker.os, "replace", replace)
    (tmp_path / "control").mkdir()
    options = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "control_folder": str(tmp_path / "control"),
    }
    with Connection("filesystem://localhost/", transport=broker.Transport, transport_options=options) as conn:
        queue = conn.SimpleQueue("q")
        queue.put({"line": 1})
        (before,) = seen_while_writing
        assert len(before) == 1 and before[0].endswith(".q.msg.part")  # what a consumer skips
        assert before[0].partition(".")[2] != "q.msg"
        assert [n for n in os.listdir(tmp_path) if n.endswith(".msg")] and not any(
            n.endswith(".part") for n in os.listdir(tmp_path)
        )
        assert queue.get(timeout=1).payload == {"line": 1}
        queue.close()
