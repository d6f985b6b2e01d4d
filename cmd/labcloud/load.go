package main

import (
	"github.com/spf13/cobra"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/imageload"
	"github.com/labcloud/labcloud/lab/registry"
)

const loadLong = `Load images from this host into the lab, by their own names.

The lab runs one registry on the bridge (port 5000) that every node's
containerd tries first for every image name, then the name's own registry.
An image is loaded once, into that registry: there is no copy per node, and
nodes started or restarted later pull it as the first did, with
imagePullPolicy Always or IfNotPresent. Every image of every argument is
read and checked (every layer hashed) before any is pushed: a missing
image, a corrupt tar or a name that is not a reference loads nothing.
Loading an image that is there already says so and pushes nothing.`

func loadCmd(dir *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Load images from the host into the lab (every node pulls them by their names)",
		Long:  loadLong,
	}
	load := func(use, short, long string, set func(*imageload.Options, []string)) *cobra.Command {
		return &cobra.Command{
			Use: use, Short: short, Long: long + "\n\n" + loadLong, Args: cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				st, err := rootLabState(*dir)
				if err != nil {
					return err
				}
				opts := imageload.Options{Out: cmd.OutOrStdout()}
				set(&opts, args)
				return lab.LoadImages(cmd.Context(), st, opts)
			},
		}
	}
	cmd.AddCommand(
		load("image NAME...", "Load images from the host's Docker, Podman or containerd store",
			"Each NAME is looked up in Docker's store (docker image inspect, docker save), then Podman's, then containerd's\nnamespaces default and k8s.io (ctr images export), and loaded under NAME.",
			func(o *imageload.Options, a []string) { o.Images = a }),
		load("archive FILE...", "Load every image of docker-archive or OCI layout tars",
			"Each FILE is a docker-archive (docker save, podman save, ko build --tarball; every tagged image in it is loaded\nunder its tags) or an OCI image layout tar (buildah push oci-archive:, ctr images export; each image under its\norg.opencontainers.image.ref.name or io.containerd.image.name annotation, a full NAME:TAG).",
			func(o *imageload.Options, a []string) { o.Archives = a }),
	)
	return cmd
}

// registryCmd is the lab's registry daemon, which up starts.
func registryCmd() *cobra.Command {
	var (
		dir               string
		readOnly, readOrW []string
	)
	cmd := &cobra.Command{
		Use:    "registry",
		Short:  "Serve the lab's image registry (labcloud up starts it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return registry.Serve(cmd.Context(), dir, readOnly, readOrW, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "where the images are kept")
	cmd.Flags().StringArrayVar(&readOnly, "listen", nil, "an address to serve pulls on (repeatable)")
	cmd.Flags().StringArrayVar(&readOrW, "push-listen", nil, "an address to serve pulls and pushes on (repeatable)")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}
