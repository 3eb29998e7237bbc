"""specdec's tooling: benchmarks, the soak, scale-out and layer-skip tuning runs, network
namespace hosts, the delay proxy, and references the tests compare against.

Nothing in the library (`specdec`), the services or the coordinator imports this
package, and the service images do not install it. The `specdec` command adds its
commands when it is installed (`specdec_tools.commands`, found by name in specdec.cli).
"""
