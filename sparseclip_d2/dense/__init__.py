"""Dense-prediction operations on windows, logits and label maps (torch, numpy, scipy,
scikit-learn, OpenCV; no detectron2): the sliding-window loop (:mod:`.windows`), PAMR
(:mod:`.pamr`), the first segmentation of a feedback pass (:mod:`.first_segmentation`), the test-time
augmentation and label closing (:mod:`.tta`) and the cluster vote (:mod:`.cluster_vote`). The
parts of the pipeline (``sparseclip_d2.methods``) call them."""
