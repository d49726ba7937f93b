//! amble behind a reverse proxy (nginx): upgrade headers, forwarded client addresses.
