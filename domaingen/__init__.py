"""domaingen: a domain-generalization benchmark suite.

Train a table of algorithms on a table of multi-domain datasets, hold one domain
out, sweep random hyperparameters, select models without peeking at the
held-out domain, and report leave-one-domain-out accuracy tables.
"""

__version__ = "0.3.0"
