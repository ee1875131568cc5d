"""The environment, agent and resources servers, each as one process or as several workers; the episodes they run
as steps with boundaries. The policy model server is `fakes.gym.policy`."""
