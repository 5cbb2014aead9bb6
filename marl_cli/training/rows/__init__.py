"""Where a step's rows come from: rollouts in this process (``sources``), a rollout worker process ahead of the
learner (``rollout_worker``), the decoupled trainers' store (``decoupled``), dealt across ranks (``distributed``)."""
