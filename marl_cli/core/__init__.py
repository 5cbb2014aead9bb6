"""The ground floor every layer stands on: the row type (``samples``), padding rows into tensors (``padding``) and
this process's place among the run's processes (``world``)."""
