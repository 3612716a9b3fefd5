"""What kas offers its modules (upstream ``modserver``): the module API and the shared server services.

The kas process builds these; modules import them, never the process package ``tether.kas``.
"""
