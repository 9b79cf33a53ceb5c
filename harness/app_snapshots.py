"""What the console's SVG snapshot tests share: the terminal size and the wait until the app has drawn its
first snapshot and journal."""
from __future__ import annotations

SIZE = (150, 48)


async def settle(pilot) -> None:
    app = pilot.app
    for _ in range(100):
        if app.last_snapshot is not None and app.query_one("#journal").unit:
            break
        await pilot.pause(0.02)
    await pilot.pause(0.2)
