from sage_rl.cli import main

main()
