"""
HARNESS, the tag: its configuration (settings: the flags, frozen), its state rebuilt from git and the events on every
start (session: open_session, the Session the steps work on; tagview: the same read only) and the refusals before
anything runs (checks). The map of harness/ is in docs/architecture.md.
"""
