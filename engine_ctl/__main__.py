from engine_ctl.cli import main

main()
