package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/labcloud/labcloud/lab"
)

// Checks of flag values, each returning a *lab.FlagError that names the
// flag and the value; commands run them before they touch anything.

func positive(flag string, n int) error {
	if n < 1 {
		return &lab.FlagError{Flag: flag, Value: fmt.Sprint(n), Reason: "must be at least 1"}
	}
	return nil
}

func positiveDuration(flag string, d time.Duration) error {
	if d <= 0 {
		return &lab.FlagError{Flag: flag, Value: d.String(), Reason: "must be positive"}
	}
	return nil
}

func regexpFlag(flag, re string) error {
	if _, err := regexp.Compile(re); err != nil {
		return &lab.FlagError{Flag: flag, Value: re, Reason: err.Error()}
	}
	return nil
}

func existingFile(flag, path string) error {
	fi, err := os.Stat(path)
	switch {
	case path == "":
		return &lab.FlagError{Flag: flag, Value: `""`, Reason: "must name a file"}
	case err != nil:
		return &lab.FlagError{Flag: flag, Value: path, Reason: err.Error()}
	case !fi.Mode().IsRegular():
		return &lab.FlagError{Flag: flag, Value: path, Reason: "is not a regular file"}
	}
	return nil
}

// outputFile: a file to write, in a directory that exists.
func outputFile(flag, path string) error {
	if path == "" {
		return &lab.FlagError{Flag: flag, Value: `""`, Reason: "must name a file"}
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return &lab.FlagError{Flag: flag, Value: path, Reason: "is a directory"}
	}
	return parentExists(flag, path)
}

// outputDir: a directory to write into: it is one, or can be made.
func outputDir(flag, path string) error {
	if path == "" {
		return &lab.FlagError{Flag: flag, Value: `""`, Reason: "must name a directory"}
	}
	if fi, err := os.Stat(path); err == nil {
		if !fi.IsDir() {
			return &lab.FlagError{Flag: flag, Value: path, Reason: "exists and is not a directory"}
		}
		return nil
	}
	return parentExists(flag, path)
}

func parentExists(flag, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return &lab.FlagError{Flag: flag, Value: path, Reason: err.Error()}
	}
	fi, err := os.Stat(filepath.Dir(abs))
	if err != nil || !fi.IsDir() {
		return &lab.FlagError{Flag: flag, Value: path, Reason: fmt.Sprintf("directory %s does not exist", filepath.Dir(abs))}
	}
	return nil
}

// completeNodes completes a node name from the lab's state file.
func completeNodes(dir *string) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		st, err := lab.LoadState(*dir)
		if err != nil || st.Light {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return withPrefix(st.Nodes, prefix), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeLogs completes a component name of `labcloud logs`.
func completeLogs(dir *string) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		st, err := lab.LoadState(*dir)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return withPrefix(lab.LogNames(st), prefix), cobra.ShellCompDirectiveNoFileComp
	}
}

func withPrefix(names []string, prefix string) []cobra.Completion {
	var out []cobra.Completion
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}
