"""`teola demo`: a multi-query RAG chain on the embedded engines, plain LangChain vs teola.optimize."""
