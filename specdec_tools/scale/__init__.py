"""Scale-out, run for real on one machine (issue 17).

Each node of a multi-node Ray cluster, and each draft or target replica, is a host of its
own: a network namespace on one bridged LAN (specdec_tools.netns.lan). The pieces:

  cluster    a Ray head and workers started with `ray start` on LAN hosts, the
             coordinator joining them with --ray-address, Serve's proxies on every node
  monitor    a Ray driver that samples the coordinator's Serve replicas per node
  pools      draft and target replicas as hosts behind a `dns:` name, records in the
             coordinator host's /etc/hosts added and removed as replicas come and go
  load       client streams of generations, each checked against its reference
  scenarios  the multi-node run, the autoscaling ramp, the pools and the rolling
             replacement, each a report of what it measured (`specdec bench-scale`)
"""
