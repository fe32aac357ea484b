"""The scheduler shared by gateway processes through Redis (``FAIRGATE_SCHEDULER=shared``):
`protocol` (commands, answers, one step applied to the engine), `replica` (the engine kept exact
by replaying the steps), `owner` (the dispatcher's lease, steps, snapshots), `client` (a gateway's
end). Plain asyncio and redis-py; no Django."""
