"""
HARNESS, the tag: its configuration (settings: the flags, frozen), its state rebuilt from git and the events on
every start (opening: open_session; session: the Session the steps work on; tagview: the same, read only) and the
refusals before anything runs (checks). The map of harness/ is in docs/architecture.md.
"""
