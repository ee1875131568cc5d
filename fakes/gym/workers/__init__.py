"""A server as several uvicorn workers behind one port (reference 1.4, Appendix B): the coordinator and worker
processes, the channel between them, and where each call is served (placement, session routing). Generic: the
policy model (`fakes.gym.policy.model_workers`) and the other servers (`fakes.gym.servers.participant_workers`) are
built on it."""
