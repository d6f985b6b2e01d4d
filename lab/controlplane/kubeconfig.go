package controlplane

import (
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig returns a kubeconfig that reaches server with a bearer token.
func Kubeconfig(server string, caPEM []byte, user, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["labcloud"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["labcloud"] = &clientcmdapi.Context{Cluster: "labcloud", AuthInfo: user}
	cfg.CurrentContext = "labcloud"
	return clientcmd.Write(*cfg)
}

// WriteKubeconfig writes Kubeconfig to path, mode 0600.
func WriteKubeconfig(path, server string, caPEM []byte, user, token string) error {
	b, err := Kubeconfig(server, caPEM, user, token)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
