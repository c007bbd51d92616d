"""The audit log: one JSON line per hook evaluation, wake, run, risk verdict and order.

Written by :class:`~daemon.audit.writer.AuditWriter` (batched, rotated daily,
bounded on disk), read back by :mod:`daemon.audit.reader`, shown by
:mod:`daemon.audit.render` and explained by :mod:`daemon.audit.why`. Records of
one event share its ``traceId``, which is how ``marketwake why`` links an event
to the hooks it ran, the wake it caused and the orders that followed.
"""
