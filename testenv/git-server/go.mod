module github.com/infera/testenv/git-server

go 1.24.0
