{{/* Names, labels and the operator's settings, shared by every template. */}}

{{/* The chart's name: app.kubernetes.io/name of every object. */}}
{{- define "neuronmodel-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Objects are named "<release>-operator" (release neuronmodel: neuronmodel-operator); a release whose name already
ends in "-operator" keeps it. */}}
{{- define "neuronmodel-operator.fullname" -}}
{{- if hasSuffix "-operator" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "neuronmodel-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels that select the operator pods; never change them (Deployment selectors are immutable). */}}
{{- define "neuronmodel-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neuronmodel-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "neuronmodel-operator.labels" -}}
{{ include "neuronmodel-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "neuronmodel-operator.chart" . }}
{{- end -}}

{{- define "neuronmodel-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "neuronmodel-operator.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "neuronmodel-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The operator's one rules file (a checked copy of rbac/operator-rules.yaml): {namespaced: [...], cluster: [...]}. */}}
{{- define "neuronmodel-operator.rules" -}}
{{- .Files.Get "files/operator-rules.yaml" -}}
{{- end -}}

{{/* RBAC of kopf's peering objects (kopf watches them and patches its keep-alives into their status). */}}
{{- define "neuronmodel-operator.peeringRule" -}}
- apiGroups: [kopf.dev]
  resources: [{{ . }}]
  verbs: [get, list, watch, patch]
{{- end -}}

{{/* Fails the render on values that the schema cannot express. */}}
{{- define "neuronmodel-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.peering.enabled) -}}
{{- fail (printf "replicaCount is %d but peering.enabled is false: replicas without kopf peering would reconcile the same NeuronModels at once; set peering.enabled=true or replicaCount=1" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and .Values.proxy.noProxy (not (or .Values.proxy.https .Values.proxy.http)) -}}
{{- fail "proxy.noProxy is set but neither proxy.https nor proxy.http: set the proxy the operator's requests to the Hub take, or remove proxy.noProxy" -}}
{{- end -}}
{{- end -}}

{{/* The rules file parsed; a file that does not parse fails the render. */}}
{{- define "neuronmodel-operator.parsedRules" -}}
{{- $rules := include "neuronmodel-operator.rules" . | fromYaml -}}
{{- if or $rules.Error (not $rules.namespaced) (not $rules.cluster) (not $rules.namespace_scope) -}}
{{- fail (printf "files/operator-rules.yaml must hold the lists namespaced:, cluster: and namespace_scope: (run scripts/chart_sync.py): %v" $rules.Error) -}}
{{- end -}}
{{- toJson $rules -}}
{{- end -}}
