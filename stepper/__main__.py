from .cli import main

if __name__ == "__main__":  # not when a helper process (spawned) imports it
    main()
