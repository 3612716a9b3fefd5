"""``tether hub`` sub-commands (the group itself is in :mod:`tether.hub.command`)."""
