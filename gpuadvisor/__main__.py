try:
    from gpuadvisor import interrupt  # noqa: F401 (loaded here, inside the try, before main installs it)
    from gpuadvisor.cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI's own modules load
    import os
    import sys

    sys.stderr.write("interrupted: nothing was written\n")
    sys.stderr.flush()
    os._exit(130)

main()
