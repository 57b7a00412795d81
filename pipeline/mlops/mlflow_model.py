"""The models-from-code file MLflow keeps with every registered version: it names the model class instead of
pickling an instance. MLflow runs this file when it loads a version (`mlflow models serve`,
`mlflow.pyfunc.load_model`); importing it anywhere else is never needed.
"""

import mlflow.models

from pipeline.mlops.pyfunc import DecisionPyfunc

mlflow.models.set_model(DecisionPyfunc())
