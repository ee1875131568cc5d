"""A look-alike deployment launched: `Stack` (the backend plus the Gym servers of one topology, started, crashed
and restarted), its command line (`python -m fakes.stack`), the topologies, and a look-alike of Gym's head server."""
