module github.com/infera/testenv/hf-hub

go 1.24.0
