"""The one training skeleton (``loop``) and the two jobs that plug into it."""
