"""Tools: the command line and the CRD generator. May import every lower layer."""
