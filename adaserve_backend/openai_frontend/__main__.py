from .http_app import main

main()
