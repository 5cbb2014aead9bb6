"""Loss terms added to TRL's policy loss (EPO's entropy terms)."""
