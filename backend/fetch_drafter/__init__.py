"""The fetch-drafter stage: a published EAGLE-3 drafter downloaded on the host, converted when needed."""

STAGE = "fetch_drafter"  # its run directories' stage (the console and backend/servable.py name it too)
