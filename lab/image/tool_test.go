package image

import "os/exec"

func runTool(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}
