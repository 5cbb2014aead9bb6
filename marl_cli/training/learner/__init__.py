"""The learner: the per-policy update through TRL's loss (``policy_trainer``, ``trl_adapter``, ``trl_args``) and its
sharded form (``sharding``)."""
