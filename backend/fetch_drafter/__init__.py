"""The fetch-drafter stage: a published EAGLE-3 drafter downloaded on the host, converted when needed."""

