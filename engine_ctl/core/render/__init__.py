"""Render: the systemd unit of each replica, escaped so that no value can inject a directive."""
