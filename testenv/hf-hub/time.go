package main

import "time"

// timeZero: files have no modification time (ServeContent then sends no Last-Modified).
var timeZero time.Time
