"""LocalHost: every Host operation against this machine."""
from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from contextlib import aclosing

import pytest

from console.host.base import CommandTimeout, HostError
from console.host.local import LocalHost

pytestmark = pytest.mark.timeout(30)


async def test_run_captures_output_and_status():
    host = LocalHost()
    res = await host.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert res.returncode == 3 and not res.ok
    assert res.stdout == "out\n" and res.stderr == "err\n"
    assert res.argv[0] == sys.executable


async def test_run_passes_input_and_keeps_arguments_verbatim():
    host = LocalHost()
    res = await host.run([sys.executable, "-c", "import sys; print(sys.argv[1], sys.stdin.read())", "a b;$x'"],
                         input="hello")
    assert res.stdout == "a b;$x' hello\n"


async def test_run_missing_program_is_127():
    res = await LocalHost().run(["/nonexistent/program"])
    assert res.returncode == 127 and "/nonexistent/program" in res.stderr


async def test_run_check_raises_on_failure():
    with pytest.raises(HostError, match="exit 1"):
        await LocalHost().run(["false"], check=True)


async def test_run_timeout_kills_the_process(tmp_path):
    pidfile = tmp_path / "pid"
    code = f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout):
        await LocalHost().run([sys.executable, "-c", code], timeout=1.0)
    assert time.monotonic() - t0 < 10
    pid = int(pidfile.read_text())
    await asyncio.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_stream_yields_lines_and_keeps_carriage_returns():
    code = "import sys\nfor i in range(3): print(f'{i}%\\r{i+1}0%', flush=True)\nprint('done')"
    async with aclosing(LocalHost().stream([sys.executable, "-c", code])) as lines:
        got = [line async for line in lines]
    assert got == ["0%\r10%", "1%\r20%", "2%\r30%", "done"]


async def test_stream_kills_child_when_consumer_stops(tmp_path):
    pidfile = tmp_path / "pid"
    code = (f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid()))\n"
            "while True: print('tick', flush=True); time.sleep(0.05)")
    async with aclosing(LocalHost().stream([sys.executable, "-u", "-c", code])) as lines:
        async for line in lines:
            assert line == "tick"
            break
    pid = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


async def test_stream_kills_child_when_cancelled(tmp_path):
    pidfile = tmp_path / "pid"
    code = f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(60)"

    async def consume():
        async with aclosing(LocalHost().stream([sys.executable, "-c", code])) as lines:
            async for _ in lines:
                pass

    task = asyncio.create_task(consume())
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text():
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


async def test_read_from_is_incremental_and_detects_truncation(tmp_path):
    host = LocalHost()
    path = tmp_path / "log.txt"
    missing = await host.read_from(str(path))
    assert (missing.data, missing.size, missing.next_offset) == (b"", 0, 0)
    path.write_bytes(b"one\n")
    c1 = await host.read_from(str(path))
    assert (c1.data, c1.offset, c1.next_offset, c1.size) == (b"one\n", 0, 4, 4)
    with open(path, "ab") as f:
        f.write(b"two\n")
    c2 = await host.read_from(str(path), c1.next_offset)
    assert (c2.data, c2.offset, c2.next_offset, c2.size) == (b"two\n", 4, 8, 8)
    c3 = await host.read_from(str(path), 0, max_bytes=2)
    assert (c3.data, c3.next_offset) == (b"on", 2)
    path.write_bytes(b"x\n")  # truncated and rewritten
    c4 = await host.read_from(str(path), c2.next_offset)
    assert c4.size < c2.next_offset and c4.data == b""


async def test_upload_is_atomic_with_mode(tmp_path):
    host = LocalHost()
    target = tmp_path / "run.sh"
    target.write_text("old")
    before = os.stat(target).st_ino
    await host.upload(b"#!/bin/sh\necho hi\n", str(target), mode=0o750)
    assert target.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o750
    assert os.stat(target).st_ino != before  # replaced by rename, never rewritten in place
    assert [p.name for p in tmp_path.iterdir()] == ["run.sh"]  # no temp file left behind


async def test_forward_port_yields_the_port_itself():
    async with LocalHost().forward_port(8000) as port:
        assert port == 8000


async def test_stream_skips_an_overlong_line_and_goes_on():
    code = "print('x' * (2 << 20)); print('after')"
    async with aclosing(LocalHost().stream([sys.executable, "-c", code])) as lines:
        got = [line async for line in lines]
    assert got == ["after"]
