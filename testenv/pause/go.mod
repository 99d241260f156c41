module github.com/infera/testenv/pause

go 1.24.0
