"""The hub half of ``audit``: the rules for a batch kas sends, pure and storage-free.

``tether.hub`` stores the events (``db/audit.py``), serves them (``api/routes_audit*.py``) and shows them in the
console (``console/audit_pages.py``).
"""
