"""Separate hosts on one machine: Linux network namespaces. network (namespaces joined
point to point, shaped links), lan (hosts on one bridged LAN, /etc/hosts per host for DNS
records), services (a specdec service started inside a namespace)."""
