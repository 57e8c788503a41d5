"""CNHubert, the reference clip's content encoder (``model``)."""
