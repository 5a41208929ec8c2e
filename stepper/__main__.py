from stepper.cli.main import main

if __name__ == "__main__":  # run as `python -m stepper`, not when imported
    main()
